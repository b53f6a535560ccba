"""Policy documents: their YAML format, versioned storage in the config database (sluice.db),
and the snapshot a server serves from them."""
