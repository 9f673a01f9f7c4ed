import sys

from traces.fastjson import main

sys.exit(main())
