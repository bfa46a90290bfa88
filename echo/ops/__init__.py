"""Operations: Prometheus metrics and health probes of echo's servers (docs/metrics.md)."""
