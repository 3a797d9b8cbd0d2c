"""The pure core: views in, decisions out. No I/O, no clocks, no clients."""
