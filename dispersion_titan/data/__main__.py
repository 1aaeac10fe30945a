"""``python -m dispersion_titan.data prepare …``: see ``prepare``."""

from .prepare import main

if __name__ == "__main__":
    main()
