"""ditmem.scheduler"""
