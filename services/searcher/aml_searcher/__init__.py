"""searcher: asks the participant's Search endpoint every benchmark question."""
