"""Compatibility layers: ``orchestra.compat.ray`` runs Ray Core scripts unchanged."""
