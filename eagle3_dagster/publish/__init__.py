"""Publishing: training-set snapshots (content identity, the publish and drift gates, LATEST), the exports
trainers read (SpecForge, speculators, conversations) and the data card."""
