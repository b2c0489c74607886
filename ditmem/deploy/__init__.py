"""ditmem on Ray Serve: many engines behind one HTTP endpoint (optional extra ``ray``).

``ditmem serve --ray --replicas R`` runs :func:`ditmem.deploy.app.build_app`: an HTTP
ingress serving the same FastAPI app as ``ditmem serve`` (:func:`ditmem.server.app.create_app`
over :class:`~ditmem.deploy.remote_engine.RemoteEngine`, a stand-in for the engine whose
requests run on the replicas), an engine deployment of R replicas (:mod:`.replica`), each an
engine reserving its devices as Ray resources, routed by :class:`~.router.DitmemRequestRouter`
(the rule of :mod:`ditmem.scheduler.routing`), and a board where the replicas post their state
for ``/health`` and ``/metrics`` (:mod:`.board`). Each replica's rebalancer hands a parked
request late there to a replica where it is on time, as one blob through Ray's object store
(:mod:`.replica`, :mod:`ditmem.engine.handoff`). See docs/deploy.md.

One machine never needs Ray: nothing outside this package imports it.
"""
