import asyncio
import sys

import structlog
import uvicorn

from aml_gateway.main import UnsafeConfiguration, create_app, unreachable
from aml_gateway.settings import GatewaySettings
from aml_runtime.logging import configure_logging

settings = GatewaySettings()
try:
    app = create_app(settings)
    problem = asyncio.run(unreachable(settings))
except UnsafeConfiguration as refused:
    problem = str(refused)
if problem is not None:
    # One line naming what was tried, and a non-zero exit (the supervisor restarts us).
    configure_logging("gateway", settings.log_level)
    structlog.get_logger().error("gateway_start_failed", reason=problem)
    sys.exit(1)
uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
