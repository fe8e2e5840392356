"""Utilities beside the core API, named as in Ray: ``orchestra.util.scheduling_strategies``."""
