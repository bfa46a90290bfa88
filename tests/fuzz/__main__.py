"""``python -m tests.fuzz``: run the parser fuzzers (`tests.fuzz.run`)."""

import sys

from tests.fuzz.run import main

sys.exit(main())
