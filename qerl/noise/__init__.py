"""noise"""
