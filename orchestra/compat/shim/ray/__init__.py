"""``import ray`` in a process started by a script that runs under ``orchestra run --ray``:
installs orchestra's Ray names (orchestra.compat.ray.install), and the import statement
that ran this file returns the ``ray`` module install() put in sys.modules. Imported
under any other name (as orchestra.compat.shim.ray) it does nothing."""
if __name__ == "ray":
    from orchestra.compat import ray as _compat

    _compat.install()
