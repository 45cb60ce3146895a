"""Operating the deployment: deploy it locally, know its replicas, and carry out the operations of a plan
(redeploy, scale, autoscale, node loss) beside the load.

``deploy`` starts a local cluster under a scenario's settings, ``target`` is
what a run drives and may kill, ``steps`` holds one class per operation kind
(how it is performed, when it has converged, how its evidence is judged),
``operator`` runs a plan's steps one after another, ``affinity`` checks
routing after a scale step.
"""
