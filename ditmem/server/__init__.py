"""ditmem.server"""
