"""The plugin module a config names (``plugins=[my_extension_plugin]``): importing it
registers ``my_extension``'s data set, model, score and bound method."""

from my_extension import register_all

register_all()
