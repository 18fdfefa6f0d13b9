"""The worker's runtime: the Faust app and its checkpoint (outputs, acknowledgements, staged state,
then offsets), rebalance handling, codecs, the output producer, metrics and the health probe."""
