"""ditmem.memory"""
