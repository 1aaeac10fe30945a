"""``dispersion-titan plan``'s work below the trainer: the layout a config resolves to on N GPUs,
the GPUs' published figures, the roofline that prices a step, the measured GPU figures that
calibrate it, the checkpoints' disk, and the table (``plan``, ``sweep --plan``, ``paper --plan``)."""
