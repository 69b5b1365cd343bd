"""Users and roles, below the faces that check them (the REST and Data APIs, the KV port, the CLI):
users.py."""
