"""``clusterctl``: launch, validate and render cluster files."""
