from aml_adder.main import create_app
from aml_runtime.service import run_service

run_service(create_app)
