"""tp4: the four-Spark TP4 production line (profile, plan, sources, build, deploy, serve)."""

__version__ = "0.1.0"
