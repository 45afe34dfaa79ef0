"""``python -m coordination_service``: a cluster's coordination service in a process of its own
(see :mod:`coordination_service.process`)."""
