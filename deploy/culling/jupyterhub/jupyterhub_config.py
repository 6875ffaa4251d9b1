# The gpu-idle-culler service (gpu_idle_culler.py, beside this file) and its role, for a
# JupyterHub that spawns on Kubernetes with KubeSpawner (docs/culling.md). Append it to your
# jupyterhub_config.py, or with the Zero to JupyterHub chart put it in hub.extraConfig and the
# script in hub.extraFiles (docs/culling.md shows both). Replace the Prometheus URL; the
# service starts as a dry run: set GPU_IDLE_CULLER_APPLY to "true" once its log names the
# servers you expect.
import sys

c = get_config()  # type: ignore[name-defined]  # noqa: F821  (JupyterHub's config loader)

# append, not =: the hub's own idle-culler, or any other service, may be configured already.
c.JupyterHub.services.append(
    {
        "name": "gpu-idle-culler",
        # A managed service: the hub starts it and gives it JUPYTERHUB_API_URL and
        # JUPYTERHUB_API_TOKEN.
        "command": [
            sys.executable,
            "/usr/local/etc/jupyterhub/gpu_idle_culler.py",
            "--prometheus-url=http://prometheus-operated.monitoring.svc:9090",
            "--idle-seconds=3600",
            "--interval=300",
        ],
        "environment": {"GPU_IDLE_CULLER_APPLY": "false"},
    }
)

c.JupyterHub.load_roles.append(
    {
        "name": "gpu-idle-culler",
        "description": "Stop servers whose pods hold a GPU idle",
        "scopes": [
            "list:users",  # GET /users?state=active: who has a server running
            "read:servers",  # each user's servers: ready, pending, name
            "admin:server_state",  # each server's spawner state: KubeSpawner's pod and namespace
            "delete:servers",  # DELETE /users/<name>/server and /users/<name>/servers/<server>
        ],
        "services": ["gpu-idle-culler"],
    }
)
