"""API keys of a server a team shares (the same functions as `rlcli tenant`).

    python scripts/tenant.py add alice --max-models 2   # prints alice's key once
    python scripts/tenant.py list | revoke alice
    python scripts/tenant.py orphans                     # runs made before --tenants was on
    python scripts/tenant.py claim alice model_a,model_b  # ... given to a tenant (server stopped)
"""

from rlcli import tenants
from rlcli.scripting import fire_main

if __name__ == "__main__":
    fire_main({"add": tenants.add, "list": tenants.list_, "revoke": tenants.revoke,
               "orphans": tenants.orphans, "claim": tenants.claim})
