from aml_runtime.service import run_service
from aml_searcher.main import create_app

run_service(create_app)
