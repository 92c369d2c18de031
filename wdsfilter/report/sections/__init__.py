"""The report's sections."""
