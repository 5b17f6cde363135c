"""``python -m cuconv.bench``: see :mod:`cuconv.bench` and ``--help``."""

from .cli import main

raise SystemExit(main())
