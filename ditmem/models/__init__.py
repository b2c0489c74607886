"""ditmem.models"""
