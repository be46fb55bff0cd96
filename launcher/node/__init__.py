"""What runs on the nodes: the node agent, the facts probe, the process-tree tools, stack dumps.

Standard library only, and importing nothing outside this package: ``launcher.node.ship`` sends
these modules' sources to a node as one ``python -c`` argument, so a node needs a Python, not the
``launch`` package (a program of the user's runs on nodes that have never installed launch).
"""
