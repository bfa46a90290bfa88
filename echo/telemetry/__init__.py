"""Server events and the PySpark pipeline that turns them into reports."""
