"""Reading a world's history: usage and cost, chain-depth tuning, the HTML report."""
