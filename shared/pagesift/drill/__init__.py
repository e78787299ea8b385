"""``pagesift drill``: a failover drill that kills a node and judges what survived.

The command (``pagesift.cli.drill``) runs ``runner.run_drill``: start what the
drill needs (locally a pair of ``pagesift serve`` children, etcd with ``--auto``, the
demo site and a webhook receiver; remotely only the site and the receiver), then per
run crawl, SIGKILL a node (or the witness) at a random point, recover as the runbook
says, rejoin the killed node, and hand what was observed to ``verdict.judge``.

The modules, by concern:

- ``verdict``: pure: the observations, the definitions of every figure (rto_s,
  pages lost, duplicates, webhook events lost / re-sent / undone) and the pass rules
  of sync and async mode; ``report``: their text and JSON;
- ``receiver``: the webhook receiver (signature verification, every delivery kept);
- ``fixture``: the local pair, etcd, the demo site, keys and config files (its
  children are ``pagesift.core.util.children.Child``: own process groups, always stopped);
- ``remote``: the operator's kill/start commands and their placeholders;
- ``observe``: the job follower, the write prober, Role calls, the final job;
- ``runner``: one run and the repeated runs, with the cleanup;
- ``choices``: the drill's fixed choices, with no imports, for the command's parser;
- ``clusterrun``: the cluster drill (every pair crawls, one pair's primary is
  SIGKILLed); ``clusterverdict``: its pure verdict, pair by pair;
- ``counting``: a site that counts its concurrent requests (politeness seen from
  outside).

The drill never signals a process it did not start (process groups of its own
children only; a deployment's nodes only through the operator's commands), every
wait is bounded, and everything it started is stopped on every way out.
"""
