"""The Ray backend: one placement group bundle a node, one actor a bundle running the node agent."""
