"""What goes on the Kafka topics between the components: the contract of agent, bootstrap and pipeline.

- ``raw``: the raw change records the agents (and bootstrap) publish and the pipeline consumes;
- ``schemas``: the table schema records on the compacted schema topic.
"""
