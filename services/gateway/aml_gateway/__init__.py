"""gateway: the platform's REST API for participants and admins."""
