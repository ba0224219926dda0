import sys

from radixkv.cli import main

sys.exit(main())
