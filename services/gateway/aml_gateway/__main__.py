import uvicorn

from aml_gateway.main import create_app
from aml_gateway.settings import GatewaySettings

settings = GatewaySettings()
uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")
