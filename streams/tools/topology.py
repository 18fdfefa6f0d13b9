"""`python -m streams.tools.topology`: the pipeline's topology, from the declarations.

The processors are declared by the agent modules (`PROCESSOR`, gathered by
`streams.agents.processors`), the producers outside the agents by the tools and the HTTP API
(`PRODUCER`); streams/runtime/topology.py renders them. README's "Topology" section and
docs/architecture.md hold the same text (`python -m streams.tools.readme` regenerates them).
"""

from __future__ import annotations

from streams.runtime.topology import Processor, Producer, describe, mermaid


def processors() -> list[Processor]:
    from streams.agents import processors as declared

    return declared()


def producers() -> list[Producer]:
    from streams.api import memory as memory_api
    from streams.tools import erase, shipper

    return [shipper.PRODUCER, erase.PRODUCER, memory_api.PRODUCER]


def markdown() -> str:
    """The generated section: the Mermaid flowchart, then the listing."""
    return "\n".join(["```mermaid", mermaid(processors(), producers()), "```", "",
                      "```text", describe(processors(), producers()), "```"])


if __name__ == "__main__":
    print(describe(processors(), producers()))
