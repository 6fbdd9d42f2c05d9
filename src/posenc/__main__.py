"""``python -m posenc`` (also what ``torchrun -m posenc`` runs)."""

from posenc.cli import main

raise SystemExit(main())
