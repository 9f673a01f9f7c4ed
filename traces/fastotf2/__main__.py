import sys

from traces.fastotf2 import main

sys.exit(main())
