"""`python -m gpufleet ...`: the same CLI as the `gpufleet` console script."""
from gpufleet.cli import app

app(prog_name="gpufleet")
