import sys

from llama_np.cli import main

sys.exit(main())
