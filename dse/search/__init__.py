"""Search strategies: they propose designs, the scorer scores them, the run folder keeps them."""
