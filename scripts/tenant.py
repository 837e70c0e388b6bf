"""API keys of a server a team shares (the same commands as `rlcli tenant`).

    python scripts/tenant.py add alice --max-models 2   # prints alice's key once
    python scripts/tenant.py list | revoke alice
    python scripts/tenant.py orphans                     # runs made before --tenants was on
    python scripts/tenant.py claim alice model_a,model_b  # ... given to a tenant (server stopped)
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("tenant")
