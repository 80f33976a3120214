"""HTML report builder (filled by the report issue)."""
