"""api_schemas."""
