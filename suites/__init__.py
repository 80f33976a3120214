"""Built-in suites, as TOML data files."""
