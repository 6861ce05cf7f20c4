"""Deploying a strategy: the strategy file's schema, ``apply`` on a DDP model, and its zero-code form."""
