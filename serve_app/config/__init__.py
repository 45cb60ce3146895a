"""The deployment's configuration: ``serve_config.yaml`` as one typed document and the pure changes made to it.

* :mod:`serve_app.config.deploy_config`: the file as a pydantic model built on Ray Serve's own schema, the
  builder's arguments (``FuzzServeArgs``) typed, every change a pure function.
* :mod:`serve_app.config.kuberay`: the KubeRay RayService manifests in ``deploy/``, generated from the Serve
  configs and the cluster's environment table; :mod:`serve_app.config.kuberay_schema`: their offline checks
  (KubeRay's CRD schema and operator rules, Ray Serve's schema, the project's config).
* :mod:`serve_app.config.names`: the names Serve gives what the app deploys, and how to read a replica's id out
  of them.
"""
