"""What operators look at: Prometheus metrics of a run's requests and bytes."""
