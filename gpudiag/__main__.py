import sys

from gpudiag.cli import main

sys.exit(main())
