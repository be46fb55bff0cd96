"""The pure planner: a job and a cluster become a frozen Plan (argv, env, batch, rendezvous).
No sockets, clocks or environment reads; backends hand it their policy as a value."""
