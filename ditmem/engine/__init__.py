"""ditmem.engine"""
