"""``python -m sao_gym.cli``: the ``sao-gym`` command."""

import sys

from sao_gym.cli import main

sys.exit(main())
