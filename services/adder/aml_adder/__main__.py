import asyncio

from aml_adder.main import create_app

asyncio.run(create_app().run())
