"""The Ray Serve deployments of the app (``serve_app.py`` builds it from them): the HTTP edge
(``http``), the lookup router (``router``), the VM deployment (``vm``), the precompute
deployment (``precompute``) and what they share (``backend``)."""
