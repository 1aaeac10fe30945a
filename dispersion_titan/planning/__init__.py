"""``dispersion-titan plan``'s work, above the trainer it measures: the layout a config resolves to
on N GPUs, the trainer built as rank 0 of that world (``fake_world``), its step measured under
``FakeTensorMode`` or run once (``dry_run``), the roofline and GPU figures that price the step,
and the tables (``plan``, ``sweep --plan``, ``paper --plan``)."""
